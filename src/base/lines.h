// Line-oriented input files (JSON lines, token-id lines): the one loop over a file's non-blank lines
// with each line's "FILE:LINE" for messages, and the one JSON-line parser.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <string>

namespace hs {

// fn(line, where, N) for each non-blank line of `text` (trimmed), where = "PATH:N" (N counts from 1,
// blank lines included); fn returns false to stop early.
void for_each_line(const std::string& text, const std::string& path,
                   const std::function<bool(const std::string& line, const std::string& where, int line_no)>& fn);

// One line as JSON: DataError "WHERE: not a JSON object<hint>" when it does not parse (whether the
// value is an object, and what it holds, is the caller's to check).
nlohmann::json parse_json_line(const std::string& line, const std::string& where, const std::string& hint = {});

}  // namespace hs
