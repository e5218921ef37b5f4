# Snapshot writer (pickle/JSON encoder, PyTorch snapshot schema) and OOM messages.
find_package(Python3 REQUIRED COMPONENTS Interpreter)
add_executable(test_snapshot ${CMAKE_CURRENT_SOURCE_DIR}/test_snapshot.c)
target_link_libraries(test_snapshot PRIVATE gm_allocator PkgConfig::CHECK)
target_compile_definitions(test_snapshot PRIVATE
  GM_PYTHON3="${Python3_EXECUTABLE}"
  GM_SNAPSHOT_CHECK="${CMAKE_CURRENT_SOURCE_DIR}/snapshot_check.py")
add_test(NAME snapshot COMMAND test_snapshot)

add_executable(test_oom ${CMAKE_CURRENT_SOURCE_DIR}/test_oom.c)
target_link_libraries(test_oom PRIVATE gm_allocator PkgConfig::CHECK)
add_test(NAME oom COMMAND test_oom)

# Snapshots through a real daemon and real client processes, both heap modes.
add_executable(test_snapshot_live ${CMAKE_CURRENT_SOURCE_DIR}/test_snapshot_live.c)
target_link_libraries(test_snapshot_live PRIVATE gm_testutil gm_ipc PkgConfig::CHECK)
target_compile_definitions(test_snapshot_live PRIVATE GPUMEMCTL_BIN="$<TARGET_FILE:gpumemctl>"
  GM_TEST_CLIENT="$<TARGET_FILE:gm-test-client>" GM_PYTHON3="${Python3_EXECUTABLE}"
  GM_SNAPSHOT_CHECK="${CMAKE_CURRENT_SOURCE_DIR}/snapshot_check.py")
add_dependencies(test_snapshot_live gpumemd gpumemctl gm-test-client)
foreach(heap local central)
  add_test(NAME snapshot_live_${heap} COMMAND test_snapshot_live)
  set_tests_properties(snapshot_live_${heap} PROPERTIES ENVIRONMENT "GPUMEM_TEST_BACKEND=host;GPUMEM_HEAP=${heap}"
                       TIMEOUT 600)
endforeach()
