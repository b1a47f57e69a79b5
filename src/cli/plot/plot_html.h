// The page parts of a `fusionrl plot` report: one self-contained HTML page
// (inline CSS, no script, no external reference) with a header of summary
// tiles, a grid of chart figures with captions, tables and notes. Pure
// string builders; thread-safe.
#ifndef FUSIONRL_CLI_PLOT_PLOT_HTML_H_
#define FUSIONRL_CLI_PLOT_PLOT_HTML_H_

#include <string>
#include <vector>

namespace fusionrl::cli {

// One headline figure: "EVAL ACCURACY / 0.12 -> 0.56 / initial -> final".
struct Tile {
  std::string label;
  std::string value;
  std::string detail;  // small text under the value; may be empty
};

// A table cell: its text (escaped when rendered) and whether it is a
// number (right-aligned, tabular digits).
struct Cell {
  std::string text;
  bool number = false;
};

// The whole page: <!doctype html> ... `body_html` ... </html>, with the
// report's CSS. `title` is plain text.
std::string HtmlPage(const std::string& title, const std::string& body_html);

// <header>: the title, one muted line per `facts` entry (plain text) and
// the tiles.
std::string HeaderHtml(const std::string& title,
                       const std::vector<std::string>& facts,
                       const std::vector<Tile>& tiles);

// <h2> section title (plain text).
std::string SectionHtml(const std::string& title);

// A chart in a card: `svg` (markup), `caption_html` (markup: use Code()
// for field names). `wide` spans both columns of the grid. Consecutive
// figures must be wrapped in GridHtml.
std::string FigureHtml(const std::string& svg, const std::string& caption_html,
                       bool wide = false);
std::string GridHtml(const std::vector<std::string>& figures);

// A table with a header row; rows may be shorter than the header.
std::string TableHtml(const std::vector<std::string>& header,
                      const std::vector<std::vector<Cell>>& rows);

// A list of notes (plain text each), or "" when there are none.
std::string NotesHtml(const std::string& title,
                      const std::vector<std::string>& notes);

// <code>text</code>, escaped.
std::string Code(const std::string& text);

}  // namespace fusionrl::cli

#endif  // FUSIONRL_CLI_PLOT_PLOT_HTML_H_
