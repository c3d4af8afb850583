#include "tessera/tune/cache.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "tessera/runtime/env.hpp"
#include "tessera/runtime/error.hpp"

namespace fs = std::filesystem;

namespace tessera::tune {

fs::path cache_dir() {
  if (auto d = env::get("TESSERA_CACHE_DIR")) {
    TESSERA_CHECK(!d->empty(), "TESSERA_CACHE_DIR is set but empty");
    return fs::path(*d);
  }
  const char* home = std::getenv("HOME");
  TESSERA_CHECK(home && *home, "tune::cache_dir: neither TESSERA_CACHE_DIR nor HOME is set");
  return fs::path(home) / ".cache" / "tessera";
}

namespace {
// Holds an exclusive flock on <file>.lock for the scope.
class FileLock {
 public:
  explicit FileLock(const fs::path& file) {
    const std::string p = file.string() + ".lock";
    fd_ = ::open(p.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    TESSERA_CHECK(fd_ >= 0, "tune::Cache: cannot open lock file {}: {}", p, std::strerror(errno));
    if (::flock(fd_, LOCK_EX) != 0) {
      const int e = errno;
      ::close(fd_);
      TESSERA_FAIL("tune::Cache: cannot lock {}: {}", p, std::strerror(e));
    }
  }
  ~FileLock() {
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};
}  // namespace

Cache::Cache(std::string name, int version, fs::path dir, OnCorrupt on_corrupt)
    : name_(std::move(name)), version_(version), dir_(std::move(dir)), on_corrupt_(on_corrupt) {
  TESSERA_CHECK(!name_.empty() && name_.find('/') == std::string::npos,
                "tune::Cache: name must be a non-empty file name, got '{}'", name_);
  file_ = dir_ / (name_ + ".json");
  reload();
}

nlohmann::json Cache::read_file(bool* corrupt) const {
  *corrupt = false;
  std::ifstream in(file_);
  if (!in) return nlohmann::json::object();  // no file yet
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json doc;
  std::string why;
  try {
    doc = nlohmann::json::parse(ss.str());
    if (!doc.is_object() || !doc.contains("entries") || !doc["entries"].is_object() || !doc.contains("version") ||
        !doc["version"].is_number_integer() || doc.value("tessera_cache", std::string()) != name_)
      why = "not a tessera cache file named '" + name_ + "'";
  } catch (const nlohmann::json::exception& e) {
    why = e.what();
  }
  if (!why.empty()) {
    if (on_corrupt_ == OnCorrupt::Throw)
      TESSERA_FAIL("tune::Cache: {} is corrupt ({}); delete it or fix it", file_.string(), why);
    fmt::print(stderr, "tessera: warning: ignoring corrupt tuning cache {} ({})\n", file_.string(), why);
    *corrupt = true;
    return nlohmann::json::object();
  }
  if (doc["version"].get<int>() != version_) {
    fmt::print(stderr, "tessera: warning: ignoring tuning cache {}: version {}, expected {}\n", file_.string(),
               doc["version"].get<int>(), version_);
    return nlohmann::json::object();
  }
  return doc["entries"];
}

void Cache::reload() {
  bool corrupt = false;
  entries_ = read_file(&corrupt);
}

void Cache::write_file(const nlohmann::json& entries) const {
  const nlohmann::json doc = {{"tessera_cache", name_}, {"version", version_}, {"entries", entries}};
  const fs::path tmp = file_.string() + fmt::format(".tmp.{}", ::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    TESSERA_CHECK(out.good(), "tune::Cache: cannot write {}", tmp.string());
    out << doc.dump(1) << '\n';
    out.flush();
    TESSERA_CHECK(out.good(), "tune::Cache: write to {} failed", tmp.string());
  }
  std::error_code ec;
  fs::rename(tmp, file_, ec);  // atomic on POSIX: readers see the old or the new file
  if (ec) {
    fs::remove(tmp);
    TESSERA_FAIL("tune::Cache: cannot rename {} to {}: {}", tmp.string(), file_.string(), ec.message());
  }
}

void Cache::put(const std::string& key, nlohmann::json value) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  TESSERA_CHECK(!ec, "tune::Cache: cannot create {}: {}", dir_.string(), ec.message());
  FileLock lock(file_);
  bool corrupt = false;
  nlohmann::json cur = read_file(&corrupt);
  if (corrupt) fs::rename(file_, file_.string() + ".corrupt", ec);  // keep it for inspection
  cur[key] = std::move(value);
  write_file(cur);
  entries_ = std::move(cur);
}

void Cache::erase(const std::string& key) {
  if (!fs::exists(file_)) { entries_.erase(key); return; }
  FileLock lock(file_);
  bool corrupt = false;
  nlohmann::json cur = read_file(&corrupt);
  cur.erase(key);
  write_file(cur);
  entries_ = std::move(cur);
}

std::optional<nlohmann::json> Cache::get(const std::string& key) const {
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return *it;
}

}  // namespace tessera::tune
