# Issue #25: each attack of a hostile local user, run as a process of another
# uid (the test binary re-executes itself as the attacker through setpriv).
add_executable(test_security ${CMAKE_CURRENT_LIST_DIR}/test_security.c)
target_link_libraries(test_security PRIVATE gm_testutil gpumem gm_ipc PkgConfig::CHECK)
target_compile_definitions(test_security PRIVATE GPUMEMCTL_BIN="$<TARGET_FILE:gpumemctl>"
  GPUMEMD_BIN="$<TARGET_FILE:gpumemd>" SECURITY_BIN="$<TARGET_FILE:test_security>")
add_dependencies(test_security gpumemd gpumemctl)
add_test(NAME security COMMAND test_security)
set_tests_properties(security PROPERTIES ENVIRONMENT "GPUMEM_TEST_BACKEND=host"
  TIMEOUT 300 SKIP_RETURN_CODE 77)
