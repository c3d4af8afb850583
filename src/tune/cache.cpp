#include "tessera/tune/cache.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

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

std::optional<std::string> read_regular_file(const fs::path& path, std::size_t max_bytes, const std::string& what,
                                             bool nofollow, bool missing_ok) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | (nofollow ? O_NOFOLLOW : 0));
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT && missing_ok) return std::nullopt;
    if (e == ELOOP && nofollow) TESSERA_FAIL("{}: {} is a symbolic link (not followed)", what, path.string());
    TESSERA_FAIL("{}: cannot open {}: {}", what, path.string(), std::strerror(e));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  TESSERA_CHECK(::fstat(fd, &st) == 0, "{}: cannot stat {}: {}", what, path.string(), std::strerror(errno));
  TESSERA_CHECK(S_ISREG(st.st_mode), "{}: {} is not a regular file", what, path.string());
  TESSERA_CHECK(static_cast<std::uint64_t>(st.st_size) <= max_bytes, "{}: {} has {} bytes (at most {})", what,
                path.string(), static_cast<std::uint64_t>(st.st_size), max_bytes);
  std::string text;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    TESSERA_CHECK(n >= 0, "{}: cannot read {}: {}", what, path.string(), std::strerror(errno));
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
    TESSERA_CHECK(text.size() <= max_bytes, "{}: {} has more than {} bytes", what, path.string(), max_bytes);
  }
  return text;
}

std::string read_file_limited(const fs::path& path, std::size_t max_bytes, const std::string& what) {
  return *read_regular_file(path, max_bytes, what, /*nofollow=*/false, /*missing_ok=*/false);
}

nlohmann::json parse_json(const std::string& text, const std::string& what, int max_depth) {
  // Depth pre-scan (brackets outside strings): nlohmann's reader and the
  // destructor of the value it builds recurse per level.
  int depth = 0;
  bool in_string = false, escaped = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      TESSERA_CHECK(++depth <= max_depth, "{}: JSON nested deeper than {} levels (at byte {})", what, max_depth, i);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    TESSERA_FAIL("{}: {}", what, e.what());
  }
}

std::int64_t json_int(const nlohmann::json& j, const std::string& what, std::int64_t lo, std::int64_t hi) {
  TESSERA_CHECK(j.is_number_integer(), "{}: expected an integer, got {}", what, j.dump().substr(0, 40));
  if (j.is_number_unsigned()) {
    const std::uint64_t u = j.get<std::uint64_t>();
    TESSERA_CHECK(hi >= 0 && u <= static_cast<std::uint64_t>(hi) && static_cast<std::int64_t>(u) >= lo,
                  "{}: {} outside [{}, {}]", what, u, lo, hi);
    return static_cast<std::int64_t>(u);
  }
  const std::int64_t v = j.get<std::int64_t>();
  TESSERA_CHECK(v >= lo && v <= hi, "{}: {} outside [{}, {}]", what, v, lo, hi);
  return v;
}

namespace {
// Holds an exclusive flock on <file>.lock for the scope (never through a symlink).
class FileLock {
 public:
  explicit FileLock(const fs::path& file) {
    const std::string p = file.string() + ".lock";
    fd_ = ::open(p.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
    TESSERA_CHECK(fd_ >= 0, "tune::Cache: cannot open lock file {}: {}", p,
                  errno == ELOOP ? "it is a symbolic link (not followed)" : std::strerror(errno));
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd_);
      TESSERA_FAIL("tune::Cache: lock file {} is not a regular file", p);
    }
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

// The cache directory must be a real directory (not a symlink to one), ours,
// and not writable by others unless sticky. Returns why not, or "".
std::string unsafe_dir(const fs::path& dir) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return fmt::format("cannot stat {}: {}", dir.string(), std::strerror(errno));
  if (S_ISLNK(st.st_mode)) return fmt::format("{} is a symbolic link (not followed)", dir.string());
  if (!S_ISDIR(st.st_mode)) return fmt::format("{} is not a directory", dir.string());
  if (st.st_uid != ::geteuid()) return fmt::format("{} belongs to uid {}, not to this user", dir.string(), st.st_uid);
  if ((st.st_mode & S_IWOTH) && !(st.st_mode & S_ISVTX)) return fmt::format("{} is writable by everyone", dir.string());
  return "";
}

bool lexists(const fs::path& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0;
}
}  // namespace

Cache::Cache(std::string name, int version, fs::path dir, OnCorrupt on_corrupt)
    : name_(std::move(name)), version_(version), dir_(std::move(dir)), on_corrupt_(on_corrupt) {
  TESSERA_CHECK(
      !name_.empty() && name_.size() <= 128 && name_.find('/') == std::string::npos && name_ != "." && name_ != "..",
      "tune::Cache: name must be a non-empty file name, got '{}'", name_);
  TESSERA_CHECK(version_ >= 0, "tune::Cache: version {} must be >= 0", version_);
  file_ = dir_ / (name_ + ".json");
  reload();
}

nlohmann::json Cache::read_file(bool* corrupt) const {
  *corrupt = false;
  nlohmann::json doc;
  std::string why;
  std::int64_t version = -1;
  try {
    if (lexists(dir_)) {
      const std::string bad = unsafe_dir(dir_);
      TESSERA_CHECK(bad.empty(), "{}", bad);
    }
    const auto text = read_regular_file(file_, kMaxCacheBytes, "tune::Cache", /*nofollow=*/true, /*missing_ok=*/true);
    if (!text) return nlohmann::json::object();  // no file yet
    doc = parse_json(*text, "tune::Cache");
    if (!doc.is_object() || !doc.contains("entries") || !doc["entries"].is_object() || !doc.contains("version") ||
        !doc.contains("tessera_cache") || !doc["tessera_cache"].is_string() ||
        doc["tessera_cache"].get<std::string>() != name_)
      why = "not a tessera cache file named '" + name_ + "'";
    else
      version = json_int(doc["version"], "version", 0, std::numeric_limits<int>::max());
  } catch (const Error& e) {
    why = e.what();
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
  if (version != version_) {
    fmt::print(stderr, "tessera: warning: ignoring tuning cache {}: version {}, expected {}\n", file_.string(), version,
               version_);
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
  const std::string text = doc.dump(1) + "\n";
  // Exclusive, unpredictable temporary in the same directory (rename is atomic there).
  std::string tmpl = (dir_ / ("." + name_ + ".json.tmp.XXXXXX")).string();
  const int fd = ::mkostemp(tmpl.data(), O_CLOEXEC);
  TESSERA_CHECK(fd >= 0, "tune::Cache: cannot create a temporary file in {}: {}", dir_.string(), std::strerror(errno));
  bool ok = ::fchmod(fd, 0644) == 0;
  for (std::size_t off = 0; ok && off < text.size();) {
    const ssize_t n = ::write(fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) off += static_cast<std::size_t>(n);
  }
  const int err = ok ? 0 : errno;
  ::close(fd);
  if (!ok) {
    ::unlink(tmpl.c_str());
    TESSERA_FAIL("tune::Cache: write to {} failed: {}", tmpl, std::strerror(err));
  }
  // rename replaces a symlink at file_ itself, never its target.
  if (::rename(tmpl.c_str(), file_.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmpl.c_str());
    TESSERA_FAIL("tune::Cache: cannot rename {} to {}: {}", tmpl, file_.string(), std::strerror(e));
  }
}

// Whether the directory may be written; throws (Throw) or warns (Warn) when not.
static bool writable_dir(const fs::path& dir, OnCorrupt policy) {
  std::error_code ec;
  if (!lexists(dir)) fs::create_directories(dir, ec);
  std::string bad = ec ? fmt::format("cannot create {}: {}", dir.string(), ec.message()) : unsafe_dir(dir);
  if (bad.empty()) return true;
  if (policy == OnCorrupt::Throw) TESSERA_FAIL("tune::Cache: {}", bad);
  fmt::print(stderr, "tessera: warning: tuning cache not written ({})\n", bad);
  return false;
}

void Cache::put(const std::string& key, nlohmann::json value) {
  if (!writable_dir(dir_, on_corrupt_)) {
    entries_[key] = std::move(value);  // this process still remembers it
    return;
  }
  FileLock lock(file_);
  bool corrupt = false;
  nlohmann::json cur = read_file(&corrupt);
  std::error_code ec;
  if (corrupt)
    fs::rename(file_, file_.string() + ".corrupt", ec);  // keep it for inspection (a link is moved, not followed)
  cur[key] = std::move(value);
  write_file(cur);
  entries_ = std::move(cur);
}

void Cache::erase(const std::string& key) {
  if (!lexists(file_) || !writable_dir(dir_, on_corrupt_)) {
    entries_.erase(key);
    return;
  }
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
