# Sleep and wake of a local session (issue 27, docs/sleep.md): a real
# gpumemd, this process the sleeper, this binary again (as uid 65534, through
# setpriv) the neighbour of another tenant that takes the freed memory. On
# the host backend and, when the build found cuda.h, over the emulated driver
# (its data checked by emulated kernels).
add_executable(test_sleep ${CMAKE_CURRENT_LIST_DIR}/test_sleep.c)
target_link_libraries(test_sleep PRIVATE gm_testutil gpumem gm_ipc PkgConfig::CHECK)
target_compile_definitions(test_sleep PRIVATE GPUMEMCTL_BIN="$<TARGET_FILE:gpumemctl>"
  SLEEP_BIN="$<TARGET_FILE:test_sleep>")
add_dependencies(test_sleep gpumemd gpumemctl)
add_test(NAME sleep_host COMMAND test_sleep)
set_tests_properties(sleep_host PROPERTIES ENVIRONMENT "GPUMEM_TEST_BACKEND=host" TIMEOUT 300)
if(GPUMEM_HAVE_CUDA)
  target_link_libraries(test_sleep PRIVATE gm_fakecuda_check)
  target_compile_definitions(test_sleep PRIVATE GM_TEST_FAKECUDA=1)
  add_dependencies(test_sleep fakecuda fakenvml)
  add_test(NAME sleep_cuda COMMAND test_sleep)
  set_tests_properties(sleep_cuda PROPERTIES TIMEOUT 300 ENVIRONMENT
    "GPUMEM_TEST_BACKEND=cuda;GPUMEM_LIBCUDA=${GPUMEM_FAKECUDA};GPUMEM_LIBNVML=${GPUMEM_FAKENVML};FAKECUDA_CAPACITY=4G;FAKECUDA_CONTEXT_BYTES=0")
endif()
