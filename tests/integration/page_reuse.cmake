# Page reuse through a real gpumemd and this process as its client, local and
# central heaps: on the host backend, and on the cuda backend over the
# emulated driver when it is built.
add_executable(test_page_reuse ${CMAKE_CURRENT_LIST_DIR}/test_page_reuse.c)
target_link_libraries(test_page_reuse PRIVATE gm_testutil gpumem PkgConfig::CHECK)
add_dependencies(test_page_reuse gpumemd)
add_test(NAME page_reuse_host COMMAND test_page_reuse)
set_tests_properties(page_reuse_host PROPERTIES ENVIRONMENT "GPUMEM_TEST_BACKEND=host" TIMEOUT 300)
if(GPUMEM_HAVE_CUDA)
  add_dependencies(test_page_reuse fakecuda fakenvml)
  add_test(NAME page_reuse_cuda COMMAND test_page_reuse)
  set_tests_properties(page_reuse_cuda PROPERTIES TIMEOUT 300 ENVIRONMENT
    "GPUMEM_TEST_BACKEND=cuda;GPUMEM_LIBCUDA=${GPUMEM_FAKECUDA};GPUMEM_LIBNVML=${GPUMEM_FAKENVML};FAKECUDA_CAPACITY=4G")
endif()
