# Local heaps (the heap in libgpumem, the daemon the owner and ledger): real
# gpumemd, real client processes, real gpumemctl. Host backend.
add_executable(test_local ${CMAKE_CURRENT_LIST_DIR}/test_local.c)
target_link_libraries(test_local PRIVATE gm_testutil gpumem gm_ipc PkgConfig::CHECK)
target_compile_definitions(test_local PRIVATE GPUMEMCTL_BIN="$<TARGET_FILE:gpumemctl>")
add_dependencies(test_local gpumemd gpumemctl)
add_test(NAME local_host COMMAND test_local)
set_tests_properties(local_host PROPERTIES ENVIRONMENT "GPUMEM_TEST_BACKEND=host" TIMEOUT 600)
