#include "tessera/runtime/env.hpp"

#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "tessera/runtime/error.hpp"

namespace tessera::env {

std::optional<std::string> get(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

std::int64_t parse_int(const std::string& text, const char* what, std::int64_t lo, std::int64_t hi) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  // strtoll skips leading white space; a value like " 5" is still malformed.
  const bool starts_ok =
      !text.empty() && (std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '-' || text[0] == '+');
  TESSERA_CHECK(starts_ok && end != nullptr && *end == '\0' && errno == 0, "{} = '{}' is not an integer", what, text);
  TESSERA_CHECK(v >= lo && v <= hi, "{} = {} is out of range [{}, {}]", what, v, lo, hi);
  return v;
}

std::optional<std::int64_t> find_int(const char* name, std::int64_t lo, std::int64_t hi) {
  auto v = get(name);
  if (!v) return std::nullopt;
  return parse_int(*v, name, lo, hi);
}

std::int64_t get_int(const char* name, std::int64_t fallback, std::int64_t lo, std::int64_t hi) {
  return find_int(name, lo, hi).value_or(fallback);
}

}  // namespace tessera::env
