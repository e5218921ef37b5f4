# The client's fence FIFO (libgpumem/fence.c) on its own, over a table of events.
add_executable(test_fence ${CMAKE_CURRENT_LIST_DIR}/test_fence.c ${PROJECT_SOURCE_DIR}/libgpumem/fence.c)
target_include_directories(test_fence PRIVATE ${PROJECT_SOURCE_DIR}/libgpumem)
target_link_libraries(test_fence PRIVATE gm_testutil PkgConfig::CHECK)
add_test(NAME page_reuse_fence COMMAND test_fence)
