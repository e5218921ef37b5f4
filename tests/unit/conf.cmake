# daemon/config.c and identity.c: the configuration file, tenant rules and peer identities.
add_executable(test_conffile ${CMAKE_CURRENT_LIST_DIR}/test_conffile.c)
target_link_libraries(test_conffile PRIVATE gm_daemon PkgConfig::CHECK)
target_compile_definitions(test_conffile PRIVATE GM_EXAMPLE_CONF="${PROJECT_SOURCE_DIR}/etc/gpumemd.conf")
add_test(NAME conffile COMMAND test_conffile)
