#include "lines.h"

#include "errors.h"
#include "util.h"

#include <fmt/format.h>

namespace hs {

void for_each_line(const std::string& text, const std::string& path,
                   const std::function<bool(const std::string& line, const std::string& where, int line_no)>& fn) {
    int line_no = 0;
    for (const auto& raw : split(text, '\n')) {
        ++line_no;
        const std::string line = trim(raw);
        if (line.empty()) continue;
        if (!fn(line, fmt::format("{}:{}", path, line_no), line_no)) return;
    }
}

nlohmann::json parse_json_line(const std::string& line, const std::string& where, const std::string& hint) {
    try {
        return nlohmann::json::parse(line);
    } catch (const std::exception&) {
        throw DataError(fmt::format("{}: not a JSON object{}", where, hint));
    }
}

}  // namespace hs
