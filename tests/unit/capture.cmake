# The process's record of CUDA graph captures (libgpumem/capture.c) on its
# own, over a table of streams the test says are capturing.
add_executable(test_capture ${CMAKE_CURRENT_LIST_DIR}/test_capture.c ${PROJECT_SOURCE_DIR}/libgpumem/capture.c)
target_include_directories(test_capture PRIVATE ${PROJECT_SOURCE_DIR}/libgpumem)
target_link_libraries(test_capture PRIVATE gm_testutil PkgConfig::CHECK Threads::Threads)
add_test(NAME capture_record COMMAND test_capture)
