// An enum's names, written once. Each vocabulary of a spec (intervention kinds, sweeps, metrics,
// positions, data kinds, stop rules) is an enum with one table of {value, name}; parsing, printing,
// the help text and the YAML layer's "expected one of" all read the same table, in its order.
#pragma once

#include "errors.h"

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hs {

template <class E>
using NameTable = std::vector<std::pair<E, const char*>>;

template <class E>
const char* name_in(const NameTable<E>& t, E e) {
    for (const auto& [v, n] : t)
        if (v == e) return n;
    return "?";
}

template <class E>
std::optional<E> find_in(const NameTable<E>& t, std::string_view s) {
    for (const auto& [v, n] : t)
        if (s == n) return v;
    return std::nullopt;
}

template <class E>
std::vector<std::string> names_in(const NameTable<E>& t) {
    std::vector<std::string> out;
    for (const auto& [v, n] : t) out.emplace_back(n);
    return out;
}

// The entries of `t` for `values`, in the order of `values`: a caller's subset of a vocabulary, so
// that its messages and help list only what it accepts, under the table's one name for each.
template <class E>
NameTable<E> subset_of(const NameTable<E>& t, const std::vector<E>& values) {
    NameTable<E> out;
    for (E v : values) out.emplace_back(v, name_in(t, v));
    return out;
}

// "a, b or c" (for messages and help text).
inline std::string or_list(const std::vector<std::string>& names) {
    std::string s;
    for (size_t i = 0; i < names.size(); ++i) s += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
    return s;
}

// A word (a flag's value) as one of a table's values; UsageError "WHAT 's': expected a, b or c"
// (the tool prefixes the flag).
template <class E>
E parse_name(const NameTable<E>& t, const std::string& s, const std::string& what) {
    if (auto v = find_in(t, s)) return *v;
    throw UsageError((what.empty() ? "" : what + " ") + "'" + s + "': expected " + or_list(names_in(t)));
}

}  // namespace hs
