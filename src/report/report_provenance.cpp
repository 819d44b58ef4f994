// headscope report: the provenance section (/meta: the model, its weights' hash, the command and
// the build that wrote the file).
#include "report_sections.h"

#include "report_draw.h"
#include "schema.h"

#include <fmt/format.h>

#include <algorithm>

namespace hs::report_detail {

std::string provenance(FileView& f) {
    if (!f.r->exists(schema::meta())) return "<p class=\"note\">no /meta group: provenance unknown</p>";
    Attrs a = schema::read_meta(*f.r);
    auto get = [&](const char* k) { return a.count(k) ? attr_to_string(a.at(k)) : std::string("?"); };
    std::string sha = get("weights_sha256");
    std::string s = fmt::format("<p class=\"desc\"><b>{}</b> ({}, {}): {} layers x {} heads ({} key/value), d_model {}, vocabulary "
                                "{}; weights sha256 <code>{}</code>; {} {}; headscope {} ({}), {}.</p>"
                                "<p class=\"desc\"><code>{}</code></p>",
                                esc(get("model_path")), esc(get("architecture")), esc(get("family")), esc(get("n_layers")),
                                esc(get("n_heads")), esc(get("n_kv_heads")), esc(get("d_model")), esc(get("vocab_size")),
                                esc(sha.substr(0, 16)) + (sha.size() > 16 ? "…" : ""), esc(get("dtype")), esc(get("device")),
                                esc(get("tool_version")), esc(get("git_commit")), esc(get("utc_time")), esc(get("command_line")));
    s += "<details><summary>all /meta attributes</summary><table class=\"kv\">";
    const std::vector<std::string> first{"model_path", "architecture", "family", "n_layers", "n_heads", "n_kv_heads", "d_model",
                                         "d_head", "vocab_size", "weights_sha256", "command_line", "tool_version", "git_commit",
                                         "utc_time", "dtype", "device", "threads", "seed"};
    for (const auto& k : first)
        if (a.count(k)) s += fmt::format("<tr><th>{}</th><td><code>{}</code></td></tr>", esc(k), esc(attr_to_string(a.at(k))));
    for (const auto& [k, v] : a)
        if (std::find(first.begin(), first.end(), k) == first.end())
            s += fmt::format("<tr><th>{}</th><td><code>{}</code></td></tr>", esc(k), esc(attr_to_string(v)));
    return section(f, "Provenance", s + "</table></details>");
}

}  // namespace hs::report_detail
