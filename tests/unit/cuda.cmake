# The cuda backend and mapper over the emulated driver (tests/lib/fakecuda),
# in process. Only when the build found cuda.h.
if(GPUMEM_HAVE_CUDA)
  # mapper_cuda.c is internal to libgpumem (hidden symbols), so the suite
  # compiles it in.
  add_executable(test_cuda_backend
    ${CMAKE_CURRENT_LIST_DIR}/test_cuda_backend.c
    ${CMAKE_SOURCE_DIR}/backend/cuda/mapper_cuda.c)
  target_include_directories(test_cuda_backend PRIVATE ${CMAKE_SOURCE_DIR}/backend ${GM_TEST_LIB_DIR}/fakecuda
    ${CUDA_INCLUDE_DIR})
  target_link_libraries(test_cuda_backend PRIVATE gm_ipc gm_backend gm_testutil gm_fakecuda_check PkgConfig::CHECK)
  add_dependencies(test_cuda_backend fakecuda)
  add_test(NAME cuda_backend COMMAND test_cuda_backend)
  add_dependencies(test_cuda_backend fakenvml)
  set_tests_properties(cuda_backend PROPERTIES ENVIRONMENT
    "GPUMEM_LIBCUDA=${GPUMEM_FAKECUDA};GPUMEM_LIBNVML=${GPUMEM_FAKENVML};GM_TEST_FAKENVML=${GPUMEM_FAKENVML}")
endif()
