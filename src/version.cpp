#include "tessera/version.hpp"

#ifndef TESSERA_VERSION_STRING
#error "TESSERA_VERSION_STRING is set by CMake (cmake/TesseraLayers.cmake)"
#endif

namespace tessera {

const char* version() { return TESSERA_VERSION_STRING; }

}  // namespace tessera
