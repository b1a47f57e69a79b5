// YAML loading with a bound on the parser's work.
//
// yaml-cpp 0.7 (Debian 12) never returns on some malformed input: a flow
// entry (',') outside [ ] or { } — a document that is just ",", or a line
// starting with "," after a block sequence — makes its parser emit null
// nodes forever, allocating until the process is killed. A job description
// arrives from users and over the network (SubmitJob), so every YAML text
// FusionRL reads goes through these functions instead of YAML::Load*.
//
// They first walk the text with a handler that counts parser events: a
// well-formed document makes at most a few events per byte, so a count past
// that bound stops the walk with a YAML::ParserException at the position the
// parser was stuck on. Then the text is loaded as usual.
#ifndef FUSIONRL_CORE_YAML_LOAD_H_
#define FUSIONRL_CORE_YAML_LOAD_H_

#include <yaml-cpp/yaml.h>

#include <string>
#include <vector>

namespace fusionrl {

// Like YAML::LoadAll. Throws YAML::Exception (ParserException with a mark
// for a runaway parse).
std::vector<YAML::Node> LoadAllYaml(const std::string& text);

// Like YAML::Load: the first document, or a null node for none.
YAML::Node LoadYaml(const std::string& text);

}  // namespace fusionrl

#endif  // FUSIONRL_CORE_YAML_LOAD_H_
