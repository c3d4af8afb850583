# Finds ONE consistent NCCL (header + library from the same installation)
# that has the symmetric-memory device API (nccl_device.h, NCCL >= 2.28).
# GPU machines may carry several copies (system 2.28.3, a Python venv's
# 2.28.9); mixing a header of one with the library of another is a silent ABI
# hazard, so a root is accepted only when it holds both.
#
# Order: TESSERA_NCCL_ROOT, $NCCL_HOME, the CUDA toolkit, the PyTorch venv's
# nvidia/nccl, /usr. The newest complete candidate wins unless
# TESSERA_NCCL_ROOT is given. The library's directory goes into the RPATH so
# the loader picks the same copy at run time; ProcessGroup also checks
# ncclGetVersion() against the header.
set(TESSERA_NCCL_ROOT "" CACHE PATH "NCCL installation root (include/nccl.h + lib/libnccl.so*)")

set(_cands)
if(TESSERA_NCCL_ROOT)
  list(APPEND _cands "${TESSERA_NCCL_ROOT}")
else()
  if(DEFINED ENV{NCCL_HOME})
    list(APPEND _cands "$ENV{NCCL_HOME}")
  endif()
  get_filename_component(_cuda_root "${CUDAToolkit_INCLUDE_DIRS}" DIRECTORY)
  list(APPEND _cands "${_cuda_root}")
  file(GLOB _venv_ncc "/opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl")
  list(APPEND _cands ${_venv_ncc} "/usr")
endif()

set(_best_ver 0)
foreach(root IN LISTS _cands)
  set(_inc "")
  foreach(d "${root}/include" "${root}/include/${CMAKE_LIBRARY_ARCHITECTURE}")
    if(EXISTS "${d}/nccl.h" AND EXISTS "${d}/nccl_device.h")
      set(_inc "${d}")
      break()
    endif()
  endforeach()
  if(NOT _inc)
    continue()
  endif()
  unset(_lib CACHE)
  find_library(_lib NAMES nccl libnccl.so.2
    PATHS "${root}/lib" "${root}/lib64" "${root}/lib/${CMAKE_LIBRARY_ARCHITECTURE}" "${root}/targets/x86_64-linux/lib"
    NO_DEFAULT_PATH)
  if(NOT _lib)
    continue()
  endif()
  file(STRINGS "${_inc}/nccl.h" _maj REGEX "^#define NCCL_MAJOR ")
  file(STRINGS "${_inc}/nccl.h" _min REGEX "^#define NCCL_MINOR ")
  file(STRINGS "${_inc}/nccl.h" _pat REGEX "^#define NCCL_PATCH ")
  string(REGEX MATCH "[0-9]+" _maj "${_maj}")
  string(REGEX MATCH "[0-9]+" _min "${_min}")
  string(REGEX MATCH "[0-9]+" _pat "${_pat}")
  math(EXPR _ver "${_maj} * 10000 + ${_min} * 100 + ${_pat}")
  message(STATUS "tessera: NCCL candidate ${_maj}.${_min}.${_pat} at ${root}")
  if(_ver LESS 22800)
    continue()
  endif()
  if(_ver GREATER _best_ver)
    set(_best_ver ${_ver})
    set(TESSERA_NCCL_INCLUDE_DIR "${_inc}")
    set(TESSERA_NCCL_LIBRARY "${_lib}")
    set(TESSERA_NCCL_VERSION "${_maj}.${_min}.${_pat}")
  endif()
  if(TESSERA_NCCL_ROOT)
    break()
  endif()
endforeach()
unset(_lib CACHE)

if(NOT TESSERA_NCCL_LIBRARY)
  message(FATAL_ERROR "No NCCL >= 2.28 with nccl_device.h and a matching libnccl was found; set TESSERA_NCCL_ROOT")
endif()
message(STATUS "tessera: using NCCL ${TESSERA_NCCL_VERSION}: ${TESSERA_NCCL_INCLUDE_DIR} + ${TESSERA_NCCL_LIBRARY}")

add_library(tessera::nccl SHARED IMPORTED GLOBAL)
set_target_properties(tessera::nccl PROPERTIES
  IMPORTED_LOCATION "${TESSERA_NCCL_LIBRARY}"
  INTERFACE_INCLUDE_DIRECTORIES "${TESSERA_NCCL_INCLUDE_DIR}")
get_filename_component(TESSERA_NCCL_LIBDIR "${TESSERA_NCCL_LIBRARY}" DIRECTORY)
list(APPEND CMAKE_BUILD_RPATH "${TESSERA_NCCL_LIBDIR}")
list(APPEND CMAKE_INSTALL_RPATH "${TESSERA_NCCL_LIBDIR}")
