# Shared objects (issue 27): named read-only memory published by one process
# and mapped by others, the clients this binary again (by mode), under this
# uid and another. Host, and the emulated cuda driver when it is built.
find_package(Python3 REQUIRED COMPONENTS Interpreter)
add_executable(test_shared ${CMAKE_CURRENT_LIST_DIR}/test_shared.c)
target_link_libraries(test_shared PRIVATE gm_testutil gpumem PkgConfig::CHECK)
add_dependencies(test_shared gpumemd gpumemctl)
target_compile_definitions(test_shared PRIVATE GPUMEMCTL_BIN="$<TARGET_FILE:gpumemctl>"
  GM_PYTHON3="${Python3_EXECUTABLE}" GM_SNAPSHOT_CHECK="${GM_SNAPSHOT_CHECK}")
add_test(NAME shared_host COMMAND test_shared)
set_tests_properties(shared_host PROPERTIES ENVIRONMENT "GPUMEM_TEST_BACKEND=host" TIMEOUT 300 SKIP_RETURN_CODE 77)
if(GPUMEM_HAVE_CUDA AND TARGET fakecuda)
  target_link_libraries(test_shared PRIVATE gm_fakecuda_check)
  add_dependencies(test_shared fakecuda)
  add_test(NAME shared_cuda COMMAND test_shared)
  set_tests_properties(shared_cuda PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77 ENVIRONMENT
    "GPUMEM_TEST_BACKEND=cuda;GPUMEM_LIBCUDA=${GPUMEM_FAKECUDA};FAKECUDA_CAPACITY=4G")
endif()
