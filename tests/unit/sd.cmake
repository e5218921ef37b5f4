# daemon/sd.c (sd-daemon glue) in process.
add_executable(test_sd ${CMAKE_CURRENT_LIST_DIR}/test_sd.c)
target_link_libraries(test_sd PRIVATE gm_daemon PkgConfig::CHECK)
add_test(NAME sd COMMAND test_sd)
