// libFuzzer entry point (built only with clang: tests/tools/CMakeLists.txt).
// The first byte chooses the target: even — the data is a CommIR text;
// odd — the data is a `tessera plan` argument list, one argument per line.
// A tessera::Error is a valid rejection; anything else reaches libFuzzer.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "fuzz_plan.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const bool args = data[0] & 1;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  static std::FILE* null_out = std::fopen("/dev/null", "w");
  try {
    if (!args) {
      tessera::fuzz::one_text(text, (data[0] & 2) != 0);
    } else {
      std::vector<std::string> a;
      std::size_t i = 0;
      while (i <= text.size() && a.size() < 32) {
        const std::size_t j = std::min(text.find('\n', i), text.size());
        a.push_back(text.substr(i, j - i));
        i = j + 1;
      }
      a.push_back("--budget-s");  // keeps searches short; a second --budget-s is a CLI error, also fine
      a.push_back("0.01");
      tessera::fuzz::one_args(a, null_out);
    }
  } catch (const tessera::Error&) {
  }
  return 0;
}
