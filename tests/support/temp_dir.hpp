// tests/support/temp_dir.hpp — a fresh directory per test, removed afterwards.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>

namespace tessera::testing {

/// <tmp>/<prefix>_<pid>_<random>: unique across processes and tests.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "tessera_test") {
    path_ = std::filesystem::temp_directory_path() /
            (prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(std::random_device{}()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace tessera::testing
