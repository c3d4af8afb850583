# One static library per layer (cmake/layers.txt), each linking exactly the
# layers it may use, so a dependency is declared where it is taken. The
# sources come from src/<layer>/CMakeLists.txt (target_sources on
# tessera_<layer>). `tessera` (alias tessera::tessera) is the whole library.

# What every layer needs: the public include path, CUDA, NCCL, fmt, json.
add_library(tessera_base INTERFACE)
target_include_directories(tessera_base INTERFACE
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include> $<INSTALL_INTERFACE:include>)
target_link_libraries(tessera_base INTERFACE
  tessera::nccl CUDA::cudart CUDA::cublasLt fmt::fmt nlohmann_json::nlohmann_json Threads::Threads)
target_compile_features(tessera_base INTERFACE cxx_std_20)

file(STRINGS "${PROJECT_SOURCE_DIR}/cmake/layers.txt" _layer_lines REGEX "^[a-z]+:")
set(TESSERA_LAYERS "")
foreach(line IN LISTS _layer_lines)
  string(REGEX MATCH "^[a-z]+" layer "${line}")
  string(REGEX REPLACE "^[a-z]+:[ ]*" "" deps "${line}")
  separate_arguments(deps)
  add_library(tessera_${layer} STATIC)
  target_link_libraries(tessera_${layer} PUBLIC tessera_base)
  foreach(d IN LISTS deps)
    if(NOT TARGET tessera_${d})
      message(FATAL_ERROR "cmake/layers.txt: layer '${layer}' uses '${d}', which is not listed above it")
    endif()
    target_link_libraries(tessera_${layer} PUBLIC tessera_${d})
  endforeach()
  target_compile_options(tessera_${layer} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra $<$<BOOL:${TESSERA_WERROR}>:-Werror>>
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -Xcompiler=-Wall>)
  set_target_properties(tessera_${layer} PROPERTIES CUDA_SEPARABLE_COMPILATION OFF EXPORT_NAME ${layer})
  add_subdirectory(${PROJECT_SOURCE_DIR}/src/${layer} ${PROJECT_BINARY_DIR}/src/${layer})
  list(APPEND TESSERA_LAYERS ${layer})
endforeach()

# The whole library: every layer, plus the version string.
add_library(tessera STATIC ${PROJECT_SOURCE_DIR}/src/version.cpp)
add_library(tessera::tessera ALIAS tessera)
target_compile_definitions(tessera PRIVATE TESSERA_VERSION_STRING="${PROJECT_VERSION}")
foreach(layer IN LISTS TESSERA_LAYERS)
  target_link_libraries(tessera PUBLIC tessera_${layer})
endforeach()
target_compile_options(tessera PRIVATE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra>
  $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -Xcompiler=-Wall>)
set_target_properties(tessera PROPERTIES CUDA_SEPARABLE_COMPILATION OFF)

# ---- install + export: find_package(Tessera CONFIG) ---------------------------
# Exported when fmt and nlohmann-json come from system packages (a vendored
# header-only copy, as on the GPU machines, is not part of the export).
if(fmt_FOUND AND nlohmann_json_FOUND AND NOT SKBUILD)
  include(GNUInstallDirs)
  include(CMakePackageConfigHelpers)
  set(_layer_targets "")
  foreach(layer IN LISTS TESSERA_LAYERS)
    list(APPEND _layer_targets tessera_${layer})
  endforeach()
  set_target_properties(tessera_base PROPERTIES EXPORT_NAME base)
  install(TARGETS tessera_base tessera ${_layer_targets} EXPORT TesseraTargets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
    INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/tessera DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev)
  install(EXPORT TesseraTargets NAMESPACE tessera:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Tessera COMPONENT dev)
  configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/TesseraConfig.cmake.in
    ${PROJECT_BINARY_DIR}/TesseraConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Tessera)
  write_basic_package_version_file(${PROJECT_BINARY_DIR}/TesseraConfigVersion.cmake
    VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
  install(FILES ${PROJECT_BINARY_DIR}/TesseraConfig.cmake ${PROJECT_BINARY_DIR}/TesseraConfigVersion.cmake
    DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Tessera COMPONENT dev)
  set(TESSERA_INSTALL_EXPORTED ON)
else()
  set(TESSERA_INSTALL_EXPORTED OFF)
endif()
