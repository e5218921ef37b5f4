# The fixed-layout codec of the hot messages (issue 26) on the wire: what
# the daemon offers, answers in either codec, and refuses. Real gpumemd,
# host backend.
add_executable(test_hotmsg_wire ${CMAKE_CURRENT_LIST_DIR}/test_hotmsg_wire.c)
target_link_libraries(test_hotmsg_wire PRIVATE gm_testutil gpumem gm_ipc PkgConfig::CHECK)
add_dependencies(test_hotmsg_wire gpumemd)
add_test(NAME hotmsg_wire_host COMMAND test_hotmsg_wire)
set_tests_properties(hotmsg_wire_host PROPERTIES ENVIRONMENT "GPUMEM_TEST_BACKEND=host" TIMEOUT 120)
