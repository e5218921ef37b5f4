# Parsers of untrusted input (sizes, the envelope decoder): the fuzzers' finds as unit tests.
add_executable(test_input ${CMAKE_CURRENT_LIST_DIR}/test_input.c)
target_link_libraries(test_input PRIVATE gm_ipc gm_common PkgConfig::CHECK)
add_test(NAME input COMMAND test_input)
