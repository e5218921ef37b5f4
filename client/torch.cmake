# libgpumem_torch: PyTorch's CUDAPluggableAllocator entry points (torch_alloc.c,
# gpumem/torch.h) over libgpumem, and the pure-Python `gpumem` package.
add_library(gpumem_torch SHARED torch_alloc.c)
target_link_libraries(gpumem_torch PUBLIC gpumem PRIVATE Threads::Threads)
set_target_properties(gpumem_torch PROPERTIES VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}
                      C_VISIBILITY_PRESET hidden)
target_link_options(gpumem_torch PRIVATE -Wl,--no-undefined)
install(TARGETS gpumem_torch EXPORT gpumemTargets LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})

# The entry points have exactly the C++ types PyTorch calls them through
# (std::function<void *(size_t, int, cudaStream_t)> and
# std::function<void(void *, size_t, int, cudaStream_t)>), checked against
# CUDA's own cudaStream_t when its runtime header is at hand.
find_path(GM_CUDA_RUNTIME_INCLUDE cuda_runtime_api.h
  HINTS ENV CUDA_HOME ENV CUDA_PATH ${CUDA_INCLUDE_DIR}
  PATHS /usr/local/cuda/include /usr/include PATH_SUFFIXES include)
find_program(GM_CXX NAMES g++ c++)
if(GM_CUDA_RUNTIME_INCLUDE AND GM_CXX)
  add_custom_command(OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/torch_abi_check.stamp
    COMMAND ${GM_CXX} -std=c++17 -Wall -Wextra -Werror -fsyntax-only
            -I${CMAKE_CURRENT_SOURCE_DIR}/include -I${GM_CUDA_RUNTIME_INCLUDE}
            ${CMAKE_CURRENT_SOURCE_DIR}/torch_abi_check.cpp
    COMMAND ${CMAKE_COMMAND} -E touch ${CMAKE_CURRENT_BINARY_DIR}/torch_abi_check.stamp
    DEPENDS torch_abi_check.cpp include/gpumem/torch.h include/gpumem/gpumem.h
    COMMENT "Checking the PyTorch allocator entry points against cuda_runtime_api.h")
  add_custom_target(gpumem_torch_abi_check ALL DEPENDS ${CMAKE_CURRENT_BINARY_DIR}/torch_abi_check.stamp)
else()
  message(STATUS "gpumemd: cuda_runtime_api.h or g++ not found: the PyTorch entry point type check is skipped")
endif()

# The Python package goes where Debian's python3 looks: /usr/lib/python3/
# dist-packages for the system prefix (the Debian package), else
# lib/python3.N/dist-packages under the prefix; GPUMEM_PYTHON_DIR overrides.
# Decided at install time, so `cmake --install --prefix P` and cpack agree.
find_program(GM_DEBIAN_PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(NOT GM_DEBIAN_PYTHON3)
  find_program(GM_DEBIAN_PYTHON3 python3 REQUIRED)
endif()
execute_process(COMMAND ${GM_DEBIAN_PYTHON3} -c "import sys; print('%d.%d' % sys.version_info[:2])"
                OUTPUT_VARIABLE GM_PY_VERSION OUTPUT_STRIP_TRAILING_WHITESPACE)
set(GPUMEM_PYTHON_DIR "" CACHE STRING "Install directory of the gpumem Python package (empty: Debian's dist-packages)")
install(CODE "
  set(gm_pydir \"${GPUMEM_PYTHON_DIR}\")
  if(NOT gm_pydir)
    if(CMAKE_INSTALL_PREFIX STREQUAL \"/usr\")
      set(gm_pydir lib/python3/dist-packages)
    else()
      set(gm_pydir lib/python${GM_PY_VERSION}/dist-packages)
    endif()
  endif()
  if(NOT IS_ABSOLUTE \"\${gm_pydir}\")
    set(gm_pydir \"\${CMAKE_INSTALL_PREFIX}/\${gm_pydir}\")
  endif()
  file(INSTALL \"${PROJECT_SOURCE_DIR}/python/gpumem\" DESTINATION \"\${gm_pydir}\"
       PATTERN __pycache__ EXCLUDE PATTERN _libdir.py EXCLUDE)
  file(WRITE \"\$ENV{DESTDIR}\${gm_pydir}/gpumem/_libdir.py\"
       \"# Written by cmake --install: where libgpumem and libgpumem_torch are.\\nLIBDIR = '\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}'\\n\")
")
install(FILES ${PROJECT_SOURCE_DIR}/packaging/man/gpumem_torch.3 DESTINATION ${CMAKE_INSTALL_MANDIR}/man3)
