# The broker in process on a fake backend and host, gm_broker_check() after every step.
add_executable(test_broker ${CMAKE_CURRENT_LIST_DIR}/test_broker.c)
target_link_libraries(test_broker PRIVATE gm_testutil gm_broker PkgConfig::CHECK)
add_test(NAME broker COMMAND test_broker)

# The request table in process (calloc wrapped to fail on demand).
add_executable(test_requests ${CMAKE_CURRENT_LIST_DIR}/test_requests.c)
target_link_libraries(test_requests PRIVATE gm_testutil gm_daemon PkgConfig::CHECK)
target_link_options(test_requests PRIVATE -Wl,--wrap=calloc)
add_test(NAME requests COMMAND test_requests)
