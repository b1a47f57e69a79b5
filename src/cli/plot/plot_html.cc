#include "cli/plot/plot_html.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/plot/svg_chart.h"

namespace fusionrl::cli {
namespace {

constexpr char kCss[] = R"css(
*{box-sizing:border-box}
body{margin:0;background:#f6f8fa;color:#1f2328;
 font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,'Helvetica Neue',Arial,sans-serif}
main{max-width:1160px;margin:0 auto;padding:20px 20px 40px}
header h1{font-size:24px;margin:0 0 4px;font-weight:650;word-break:break-all}
header .fact{color:#57606a;font-size:13px;margin:0;word-break:break-all}
.tiles{display:flex;flex-wrap:wrap;gap:10px;margin:14px 0 6px}
.tile{background:#fff;border:1px solid #d0d7de;border-radius:8px;
 padding:10px 14px;min-width:150px;flex:1 1 150px}
.tile .k{font-size:11px;letter-spacing:.04em;text-transform:uppercase;color:#57606a}
.tile .v{font-size:20px;font-weight:600;font-variant-numeric:tabular-nums;
 white-space:nowrap}
.tile .d{font-size:12px;color:#57606a}
h2{font-size:17px;margin:26px 0 10px;font-weight:600}
.grid{display:grid;grid-template-columns:repeat(2,minmax(0,1fr));gap:14px}
figure{margin:0;background:#fff;border:1px solid #d0d7de;border-radius:8px;
 padding:8px 10px 10px}
figure.wide{grid-column:1/-1}
figure svg{display:block;width:100%;height:auto}
figcaption{font-size:12.5px;color:#57606a;margin:6px 4px 0}
code{font:12px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;
 background:#eff1f3;border-radius:4px;padding:0 4px;color:#1f2328}
.tablewrap{overflow-x:auto;background:#fff;border:1px solid #d0d7de;border-radius:8px}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{padding:6px 8px;border-bottom:1px solid #eaeef2;text-align:left;
 vertical-align:top}
th{background:#f6f8fa;font-weight:600;font-size:12px;vertical-align:bottom}
td{white-space:nowrap}
th.n{text-align:right}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr:last-child td{border-bottom:none}
.notes{background:#fff;border:1px solid #d0d7de;border-radius:8px;
 padding:8px 14px 8px 30px;margin:0;font-size:13px}
.notes li{margin:3px 0}
footer{color:#8c959f;font-size:12px;margin-top:28px}
@media (max-width:800px){.grid{grid-template-columns:1fr}}
@media print{body{background:#fff}figure,.tile,.tablewrap{break-inside:avoid}}
)css";

}  // namespace

std::string HtmlPage(const std::string& title, const std::string& body_html) {
  return absl::StrCat(
      "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
      "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
      "<title>",
      EscapeXml(title), "</title><style>", kCss,
      "</style></head>\n<body><main>\n", body_html,
      "\n<footer>Written by <code>fusionrl plot</code>. Self-contained: "
      "no scripts, no external files; hover a point or bar for its "
      "value.</footer>\n</main></body></html>\n");
}

std::string HeaderHtml(const std::string& title,
                       const std::vector<std::string>& facts,
                       const std::vector<Tile>& tiles) {
  std::string out = absl::StrCat("<header><h1>", EscapeXml(title), "</h1>");
  for (const std::string& f : facts) {
    absl::StrAppend(&out, "<p class=\"fact\">", EscapeXml(f), "</p>");
  }
  if (!tiles.empty()) {
    absl::StrAppend(&out, "<div class=\"tiles\">");
    for (const Tile& t : tiles) {
      absl::StrAppend(&out, "<div class=\"tile\"><div class=\"k\">",
                      EscapeXml(t.label), "</div><div class=\"v\">",
                      EscapeXml(t.value), "</div>");
      if (!t.detail.empty()) {
        absl::StrAppend(&out, "<div class=\"d\">", EscapeXml(t.detail),
                        "</div>");
      }
      absl::StrAppend(&out, "</div>");
    }
    absl::StrAppend(&out, "</div>");
  }
  absl::StrAppend(&out, "</header>\n");
  return out;
}

std::string SectionHtml(const std::string& title) {
  return absl::StrCat("<h2>", EscapeXml(title), "</h2>\n");
}

std::string FigureHtml(const std::string& svg, const std::string& caption_html,
                       bool wide) {
  return absl::StrCat("<figure", wide ? " class=\"wide\"" : "", ">", svg,
                      caption_html.empty() ? "" : "<figcaption>", caption_html,
                      caption_html.empty() ? "" : "</figcaption>",
                      "</figure>\n");
}

std::string GridHtml(const std::vector<std::string>& figures) {
  if (figures.empty()) return "";
  std::string out = "<div class=\"grid\">\n";
  for (const std::string& f : figures) absl::StrAppend(&out, f);
  absl::StrAppend(&out, "</div>\n");
  return out;
}

std::string TableHtml(const std::vector<std::string>& header,
                      const std::vector<std::vector<Cell>>& rows) {
  std::string out = "<div class=\"tablewrap\"><table><thead><tr>";
  for (const std::string& h : header) {
    absl::StrAppend(&out, "<th>", EscapeXml(h), "</th>");
  }
  absl::StrAppend(&out, "</tr></thead><tbody>\n");
  for (const std::vector<Cell>& row : rows) {
    absl::StrAppend(&out, "<tr>");
    for (const Cell& c : row) {
      absl::StrAppend(&out, c.number ? "<td class=\"n\">" : "<td>",
                      EscapeXml(c.text), "</td>");
    }
    absl::StrAppend(&out, "</tr>\n");
  }
  absl::StrAppend(&out, "</tbody></table></div>\n");
  return out;
}

std::string NotesHtml(const std::string& title,
                      const std::vector<std::string>& notes) {
  if (notes.empty()) return "";
  std::string out = absl::StrCat(SectionHtml(title), "<ul class=\"notes\">");
  for (const std::string& n : notes) {
    absl::StrAppend(&out, "<li>", EscapeXml(n), "</li>");
  }
  absl::StrAppend(&out, "</ul>\n");
  return out;
}

std::string Code(const std::string& text) {
  return absl::StrCat("<code>", EscapeXml(text), "</code>");
}

}  // namespace fusionrl::cli
