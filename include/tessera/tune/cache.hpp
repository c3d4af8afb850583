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
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace tessera::tune {

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
