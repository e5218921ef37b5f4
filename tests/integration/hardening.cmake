# Issue #17: squatting, lock-out, and input that must not get in.
add_executable(test_hardening ${CMAKE_CURRENT_LIST_DIR}/test_hardening.c)
target_link_libraries(test_hardening PRIVATE gm_testutil gpumem gm_ipc PkgConfig::CHECK Threads::Threads)
target_compile_definitions(test_hardening PRIVATE GPUMEMCTL_BIN="$<TARGET_FILE:gpumemctl>"
  GPUMEMD_BIN="$<TARGET_FILE:gpumemd>")
add_dependencies(test_hardening gpumemd gpumemctl)
add_test(NAME hardening COMMAND test_hardening)
set_tests_properties(hardening PROPERTIES ENVIRONMENT "GPUMEM_TEST_BACKEND=host;GPUMEM_HEAP=central" TIMEOUT 300
  SKIP_RETURN_CODE 77)
# The session cases again with local heaps.
add_test(NAME hardening_local COMMAND test_hardening)
set_tests_properties(hardening_local PROPERTIES
  ENVIRONMENT "GPUMEM_TEST_BACKEND=host;GPUMEM_HEAP=local;CK_RUN_CASE=sessions" TIMEOUT 300 SKIP_RETURN_CODE 77)
