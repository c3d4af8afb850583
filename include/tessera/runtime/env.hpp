// tessera/runtime/env.hpp — typed reads of environment variables.
//
// A variable that is set but malformed is an error naming the variable and
// its value; it is never silently replaced by the default.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace tessera::env {

/// The variable's value, or nullopt when unset. An empty value counts as set.
std::optional<std::string> get(const char* name);

/// Integer value of `name`, or `fallback` when unset. Throws tessera::Error if
/// the value is not an integer within [lo, hi].
std::int64_t get_int(const char* name, std::int64_t fallback, std::int64_t lo = INT64_MIN, std::int64_t hi = INT64_MAX);

/// Same as get_int, but returns nullopt when unset.
std::optional<std::int64_t> find_int(const char* name, std::int64_t lo = INT64_MIN, std::int64_t hi = INT64_MAX);

/// Parses `text` as an integer within [lo, hi]; `what` names it in the error.
std::int64_t parse_int(const std::string& text, const char* what, std::int64_t lo = INT64_MIN,
                       std::int64_t hi = INT64_MAX);

}  // namespace tessera::env
