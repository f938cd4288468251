# CMake package of an installed kvcodec_sdk.
#
#   find_package(kvcodec_sdk CONFIG REQUIRED)
#   target_link_libraries(my_plugin PRIVATE kvcodec_sdk::headers)
#
# Provides kvcodec_sdk::headers (the public contract headers: codec.h, plugin.h, layout.h,
# params.h) and kvcodec_sdk_INCLUDE_DIR. Plugins link nothing of the SDK: the contract is
# header-only and crosses into the SDK as a PyCapsule.
#
# The same file serves an installed SDK (<package>/share/cmake/kvcodec_sdk/) and the SDK's source
# tree (csrc/cmake/): a plugin inside the repository finds the headers there when it is built in
# an isolated environment where the SDK is not installed yet.
if(EXISTS "${CMAKE_CURRENT_LIST_DIR}/../include/kvcodec/codec.h")
  get_filename_component(_kvcodec_prefix "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
else()
  get_filename_component(_kvcodec_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
endif()
set(kvcodec_sdk_INCLUDE_DIR "${_kvcodec_prefix}/include")
if(NOT EXISTS "${kvcodec_sdk_INCLUDE_DIR}/kvcodec/codec.h")
  set(kvcodec_sdk_FOUND FALSE)
  set(kvcodec_sdk_NOT_FOUND_MESSAGE "kvcodec/codec.h not found under ${kvcodec_sdk_INCLUDE_DIR}")
  return()
endif()
# codec.h names cudaStream_t: the CUDA toolkit's headers come along.
include(CMakeFindDependencyMacro)
find_dependency(CUDAToolkit)
if(NOT TARGET kvcodec_sdk::headers)
  add_library(kvcodec_sdk::headers INTERFACE IMPORTED)
  set_target_properties(kvcodec_sdk::headers PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${kvcodec_sdk_INCLUDE_DIR}"
    INTERFACE_COMPILE_FEATURES cxx_std_17
    INTERFACE_LINK_LIBRARIES CUDA::toolkit)
endif()
unset(_kvcodec_prefix)
