// Typed config.json reads that name the file and key on error. Internal header.
#pragma once

#include "../errors.h"

#include <fmt/format.h>
#include <cmath>
#include <limits>
#include <type_traits>
#include <nlohmann/json.hpp>

namespace hs::cfgjson {

template <typename T>
T get(const nlohmann::json& j, const char* key, const std::string& where) {
    if (!j.contains(key) || j[key].is_null()) throw ConfigError(fmt::format("{}: missing \"{}\"", where, key));
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
        // nlohmann's get<int>() casts without a range check (a float beyond int's range is
        // undefined behaviour, a large integer wraps): accept only integral values that fit.
        const nlohmann::json& v = j[key];
        const auto lo = static_cast<double>(std::numeric_limits<T>::min());
        const auto hi = static_cast<double>(std::numeric_limits<T>::max());
        auto out_of_range = [&] {
            return ConfigError(fmt::format("{}: \"{}\" = {} is out of range [{}, {}]", where, key, v.dump(),
                                           std::numeric_limits<T>::min(), std::numeric_limits<T>::max()));
        };
        if (v.is_number_unsigned()) {
            if (v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<T>::max())) throw out_of_range();
            return static_cast<T>(v.get<uint64_t>());
        }
        if (v.is_number_integer()) {
            const int64_t i = v.get<int64_t>();
            if (i < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
                i > static_cast<int64_t>(std::numeric_limits<T>::max()))
                throw out_of_range();
            return static_cast<T>(i);
        }
        if (v.is_number_float()) {
            const double d = v.get<double>();
            if (!(d >= lo && d <= hi)) throw out_of_range();
            if (d != std::floor(d)) throw ConfigError(fmt::format("{}: \"{}\" = {} is not an integer", where, key, v.dump()));
            return static_cast<T>(d);
        }
        throw ConfigError(fmt::format("{}: \"{}\" has the wrong type", where, key));
    }
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
