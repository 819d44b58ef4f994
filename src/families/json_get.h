// Typed config.json reads that name the file and key on error. Internal header.
#pragma once

#include "../errors.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace hs::cfgjson {

template <typename T>
T get(const nlohmann::json& j, const char* key, const std::string& where) {
    if (!j.contains(key) || j[key].is_null()) throw ConfigError(fmt::format("{}: missing \"{}\"", where, key));
    try {
        return j[key].get<T>();
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
