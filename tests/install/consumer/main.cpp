// Links the installed library and calls into it without a GPU: prints the
// version and reads an environment setting through the runtime layer.
#include <cstdio>
#include <cstring>

#include "tessera/runtime/env.hpp"
#include "tessera/version.hpp"

int main() {
  const char* v = tessera::version();
  const long long timeout = tessera::env::get_int("TESSERA_CONSUMER_TEST_UNSET", 7);
  std::printf("tessera %s (default %lld)\n", v, timeout);
  return std::strlen(v) > 0 && timeout == 7 ? 0 : 1;
}
