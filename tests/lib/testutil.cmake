# What the groups share: GM_TEST_LIB_DIR (testutil.h, the fake provider,
# test_allocator.h), GM_SNAPSHOT_CHECK (the snapshot viewer checks), and
# gm_testutil (starting and stopping daemons, clients and fixtures).
set(GM_TEST_LIB_DIR ${CMAKE_CURRENT_LIST_DIR})
set(GM_SNAPSHOT_CHECK ${CMAKE_CURRENT_LIST_DIR}/snapshot_check.py)

add_library(gm_testutil STATIC ${CMAKE_CURRENT_LIST_DIR}/testutil.c)
target_include_directories(gm_testutil PUBLIC ${CMAKE_CURRENT_LIST_DIR})
target_link_libraries(gm_testutil PUBLIC gm_ipc gm_backend PkgConfig::CHECK)
target_compile_definitions(gm_testutil PRIVATE GPUMEMD_BIN="$<TARGET_FILE:gpumemd>")
if(TARGET gm_fakecuda_check) # stopping a daemon asserts the emulated device drained
  target_link_libraries(gm_testutil PUBLIC gm_fakecuda_check)
  target_compile_definitions(gm_testutil PUBLIC GM_TEST_FAKECUDA=1)
endif()
