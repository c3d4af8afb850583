// tessera/version.hpp — the library's version (the VERSION file at the
// repository root, through CMake's project()).
#pragma once

namespace tessera {

/// "MAJOR.MINOR.PATCH" of the library this program links.
const char* version();

}  // namespace tessera
