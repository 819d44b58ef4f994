// Typed config.json reads that name the file and key on error. Internal header.
#pragma once

#include "errors.h"

#include <fmt/format.h>
#include <cmath>
#include <limits>
#include <type_traits>
#include <nlohmann/json.hpp>

#include <limits>
#include <type_traits>

namespace hs::cfgjson {

template <typename T>
T get(const nlohmann::json& j, const char* key, const std::string& where) {
    if (!j.is_object()) throw ConfigError(fmt::format("{}: expected an object holding \"{}\"", where, key));
    if (!j.contains(key) || j[key].is_null()) throw ConfigError(fmt::format("{}: missing \"{}\"", where, key));
    const auto& v = j[key];
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
        // nlohmann converts 2.5 or 10^12 to int silently (truncating or wrapping): refuse both.
        if (!v.is_number_integer())
            throw ConfigError(fmt::format("{}: \"{}\" has the wrong type (expected an integer)", where, key));
        const bool fits = v.is_number_unsigned()
                              ? v.template get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max())
                              : v.template get<int64_t>() >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
                                    v.template get<int64_t>() <= static_cast<int64_t>(std::numeric_limits<T>::max());
        if (!fits)
            throw ConfigError(fmt::format("{}: \"{}\" is {}, out of range", where, key, v.dump()));
    }
    try {
        return v.template get<T>();
    } catch (const std::exception&) {
        throw ConfigError(fmt::format("{}: \"{}\" has the wrong type", where, key));
    }
}

template <typename T>
T get_or(const nlohmann::json& j, const char* key, T fallback, const std::string& where) {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    return get<T>(j, key, where);
}

}  // namespace hs::cfgjson
