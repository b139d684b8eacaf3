# Finds every third-party dependency; all come from Debian 12 packages
# (deploy/install-deps.sh). Nothing is downloaded at configure time.
find_package(Threads REQUIRED)
find_package(absl CONFIG REQUIRED)
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(SQLite3 REQUIRED)  # the coordinator's job store
# The coordinator's HTTP API. Debian builds libcpp-httplib with TLS, zlib and brotli on;
# pkg-config gives the matching defines, without which the class layouts differ.
find_package(PkgConfig REQUIRED)
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
# The GPT-2 tokenizer's pre-tokenizer pattern (\p{L}, \p{N}, look-ahead), JIT-compiled.
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
# Data-parallel replicas' gradient all-reduce between CPU stages (stage_server/collective).
# Debian's GlooConfig.cmake defines the imported target `gloo` (with its include folder)
# for its RelWithDebInfo build only; other build types fall back to that one.
find_package(Gloo CONFIG REQUIRED)
if(NOT TARGET gloo)
  message(FATAL_ERROR "GlooConfig.cmake defined no target `gloo`: install libgloo-dev "
                      "(deploy/install-deps.sh)")
endif()

# Debian's OpenBLASConfig.cmake only sets variables: wrap them in a target.
find_package(OpenBLAS CONFIG REQUIRED)
add_library(pipetrain_openblas INTERFACE)
target_include_directories(pipetrain_openblas SYSTEM INTERFACE ${OpenBLAS_INCLUDE_DIRS})
target_link_libraries(pipetrain_openblas INTERFACE ${OpenBLAS_LIBRARIES})
add_library(pipetrain::openblas ALIAS pipetrain_openblas)

# oneDNN (Debian's libdnnl-dev): the cpu backend's matrix products in fp32 and bf16,
# through its C API. Found by hand: Debian's dnnl-config.cmake insists on the OpenCL
# headers for a GPU runtime pipetrain does not use. Debian builds it on GCC's OpenMP
# (libgomp), whose thread count the cpu backend sets per calling thread and whose threads
# run its loops (parallel_ranges.h). Only with GCC: clang's OpenMP is another runtime
# (libomp, not installed), so a clang build (the fuzz targets) runs the loops on one
# thread and leaves oneDNN's thread count at its default.
find_path(PIPETRAIN_DNNL_INCLUDE oneapi/dnnl/dnnl.h)
find_library(PIPETRAIN_DNNL_LIBRARY dnnl)
if(NOT PIPETRAIN_DNNL_INCLUDE OR NOT PIPETRAIN_DNNL_LIBRARY)
  message(FATAL_ERROR "oneDNN not found: install libdnnl-dev (deploy/install-deps.sh does)")
endif()
add_library(pipetrain_dnnl INTERFACE)
target_include_directories(pipetrain_dnnl SYSTEM INTERFACE ${PIPETRAIN_DNNL_INCLUDE})
target_link_libraries(pipetrain_dnnl INTERFACE ${PIPETRAIN_DNNL_LIBRARY})
add_library(pipetrain::dnnl ALIAS pipetrain_dnnl)
add_library(pipetrain_openmp INTERFACE)
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  find_package(OpenMP REQUIRED)
  target_link_libraries(pipetrain_openmp INTERFACE OpenMP::OpenMP_CXX)
endif()
add_library(pipetrain::openmp ALIAS pipetrain_openmp)

find_program(PIPETRAIN_GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)

if(PIPETRAIN_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
