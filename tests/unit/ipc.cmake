# ipc/: transport, envelope codec, host backend.
add_executable(test_ipc ${CMAKE_CURRENT_LIST_DIR}/test_ipc.c)
target_link_libraries(test_ipc PRIVATE gm_ipc gm_backend gm_testutil PkgConfig::CHECK)
add_test(NAME ipc COMMAND test_ipc)

# ipc/hotmsg.c: the fixed-layout codec of the hot messages.
add_executable(test_hotmsg ${CMAKE_CURRENT_LIST_DIR}/test_hotmsg.c)
target_link_libraries(test_hotmsg PRIVATE gm_ipc PkgConfig::CHECK)
add_test(NAME hotmsg COMMAND test_hotmsg)
