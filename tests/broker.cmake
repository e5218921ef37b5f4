# The broker in process on a fake backend and host, gm_broker_check() after every step.
add_executable(test_broker ${CMAKE_CURRENT_LIST_DIR}/test_broker.c)
target_link_libraries(test_broker PRIVATE gm_broker PkgConfig::CHECK)
add_test(NAME broker COMMAND test_broker)
