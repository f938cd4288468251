# CMake package of an installed kvcodec_sdk.
#
#   find_package(kvcodec_sdk CONFIG REQUIRED)
#   target_link_libraries(my_plugin PRIVATE kvcodec_sdk::headers)
#
# Provides kvcodec_sdk::headers (the public contract headers: codec.h, plugin.h, layout.h,
# params.h and the header-only helpers beside them) and kvcodec_sdk_INCLUDE_DIR. Plugins link
# nothing of the SDK: the contract is header-only and crosses into the SDK as a PyCapsule.
#
# With COMPONENTS plugin it also enables CUDA (for the architectures in KVCODEC_CUDA_ARCHITECTURES
# when CMAKE_CUDA_ARCHITECTURES is not set) and finds Python and pybind11, for the two helpers a
# codec plugin's CMakeLists.txt is made of (the plugin template's shows them; its project() names
# only CXX):
#
#   kvcodec_sdk_codec_library(<target> [IEEE] SOURCES <file>...)
#     A static library of a codec's C++ and CUDA sources with what every plugin needs: the
#     contract headers and the csrc/ folder on the include path, the CUDA runtime linked
#     statically (the module needs no libcudart at run time), C++17 and CUDA C++17,
#     position-independent code, warnings, line info in device code. IEEE: plain IEEE float
#     arithmetic on both sides, for CPU and CUDA blobs equal byte for byte (no contraction into
#     FMA, no fast-math, IEEE division, denormals kept).
#
#   kvcodec_sdk_python_module(<name> SOURCES <file>... LIBRARIES <target>... DESTINATION <dir>)
#     A pybind11 extension module linking the libraries, installed into the package folder <dir>.
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
# CUDA is enabled here, not in a plugin's project(): the architectures must be set first, and
# scikit-build passes them as KVCODEC_CUDA_ARCHITECTURES (pyproject.toml; without it, the
# compiler's default).
if("plugin" IN_LIST kvcodec_sdk_FIND_COMPONENTS AND NOT CMAKE_CUDA_COMPILER_LOADED)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND DEFINED KVCODEC_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES ${KVCODEC_CUDA_ARCHITECTURES})
  endif()
  enable_language(CUDA)
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


if("plugin" IN_LIST kvcodec_sdk_FIND_COMPONENTS)
  find_dependency(Python 3.10 COMPONENTS Interpreter Development.Module)
  find_dependency(pybind11 CONFIG)
  set(kvcodec_sdk_plugin_FOUND TRUE)
endif()

function(kvcodec_sdk_codec_library target)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "IEEE" "" "SOURCES")
  add_library(${target} STATIC ${ARG_SOURCES})
  target_include_directories(${target} PUBLIC "${CMAKE_CURRENT_SOURCE_DIR}/csrc")
  target_link_libraries(${target} PUBLIC kvcodec_sdk::headers CUDA::cudart_static)
  set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON
    CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall -lineinfo>)
  if(ARG_IEEE)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-ffp-contract=off -fno-fast-math>
      $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-ffp-contract=off --fmad=false -prec-div=true -ftz=false>)
  endif()
endfunction()

function(kvcodec_sdk_python_module name)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "" "DESTINATION" "SOURCES;LIBRARIES")
  if(NOT COMMAND pybind11_add_module)
    message(FATAL_ERROR "kvcodec_sdk_python_module needs pybind11: find_package(kvcodec_sdk CONFIG REQUIRED COMPONENTS plugin)")
  endif()
  pybind11_add_module(${name} MODULE ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBRARIES})
  install(TARGETS ${name} LIBRARY DESTINATION ${ARG_DESTINATION})
endfunction()
