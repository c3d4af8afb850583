// tessera/tune/cache.hpp — a small on-disk JSON cache for tuning results.
//
// One file per cache name: $TESSERA_CACHE_DIR/<name>.json (default
// ~/.cache/tessera), holding {"tessera_cache": name, "version": v,
// "entries": {key: value}}. Writes are atomic (temp file + rename) and
// read-modify-write under an advisory lock (<name>.json.lock, flock), so
// ranks sharing a home directory do not lose each other's entries.
// A file with another version is ignored with a warning (and replaced on
// the next put). A corrupt file is an error naming the file, or — with
// OnCorrupt::Warn — ignored with a warning and moved aside to
// <name>.json.corrupt on the next put. Keys are free-form strings; see
// tune/key.hpp for the machine/dtype/shape convention.
//
// Hardening: the cache file, its lock and the directory itself are never
// followed through a symbolic link (O_NOFOLLOW, lstat); only regular files of
// at most kMaxCacheBytes are read, without blocking (a FIFO or device is
// refused); JSON nesting deeper than kMaxJsonDepth is refused before parsing;
// the version must be an integer in [0, 2^31); temporary files are created
// exclusively with mkstemp in the cache directory, then renamed over the file.
// A refused file counts as corrupt (OnCorrupt decides); a directory that is
// unsafe to write makes put() throw (Throw) or skip the write with a warning (Warn).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace tessera::tune {

inline constexpr std::size_t kMaxCacheBytes = std::size_t{64} << 20;
inline constexpr int kMaxJsonDepth = 64;

/// Contents of a regular file of at most `max_bytes`: refuses FIFOs, devices
/// and directories without blocking, and symbolic links when `nofollow`.
/// Throws tessera::Error "<what>: ..."; returns nullopt when the file does not
/// exist and `missing_ok`.
std::optional<std::string> read_regular_file(const std::filesystem::path& path, std::size_t max_bytes,
                                             const std::string& what, bool nofollow, bool missing_ok);
/// read_regular_file that requires the file (follows links).
std::string read_file_limited(const std::filesystem::path& path, std::size_t max_bytes, const std::string& what);
/// Parses JSON, refusing nesting deeper than `max_depth` first; throws tessera::Error "<what>: ...".
nlohmann::json parse_json(const std::string& text, const std::string& what, int max_depth = kMaxJsonDepth);
/// An integer in [lo, hi] (no truncation: 2^32 + 2 is not 2); throws tessera::Error "<what>: ...".
std::int64_t json_int(const nlohmann::json& j, const std::string& what, std::int64_t lo, std::int64_t hi);

/// $TESSERA_CACHE_DIR, else $HOME/.cache/tessera (created on first write).
std::filesystem::path cache_dir();

enum class OnCorrupt { Throw, Warn };

class Cache {
 public:
  Cache(std::string name, int version, std::filesystem::path dir = cache_dir(), OnCorrupt on_corrupt = OnCorrupt::Warn);

  std::optional<nlohmann::json> get(const std::string& key) const;
  /// Stores key -> value (merged with what another process wrote meanwhile).
  void put(const std::string& key, nlohmann::json value);
  void erase(const std::string& key);
  /// All entries (as last loaded or written).
  const nlohmann::json& entries() const { return entries_; }
  /// Re-reads the file.
  void reload();

  const std::filesystem::path& file() const { return file_; }
  int version() const { return version_; }

 private:
  nlohmann::json read_file(bool* corrupt) const;  // entries or {} (never throws with Warn)
  void write_file(const nlohmann::json& entries) const;
  std::string name_;
  int version_;
  std::filesystem::path dir_, file_;
  OnCorrupt on_corrupt_;
  nlohmann::json entries_ = nlohmann::json::object();
};

}  // namespace tessera::tune
