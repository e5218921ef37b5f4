# Snapshots through a real daemon and real client processes, both heap modes.
find_package(Python3 REQUIRED COMPONENTS Interpreter)
add_executable(test_snapshot_live ${CMAKE_CURRENT_LIST_DIR}/test_snapshot_live.c)
target_link_libraries(test_snapshot_live PRIVATE gm_testutil gm_ipc PkgConfig::CHECK)
target_compile_definitions(test_snapshot_live PRIVATE GPUMEMCTL_BIN="$<TARGET_FILE:gpumemctl>"
  GM_TEST_CLIENT="$<TARGET_FILE:gm-test-client>" GM_PYTHON3="${Python3_EXECUTABLE}"
  GM_SNAPSHOT_CHECK="${GM_SNAPSHOT_CHECK}")
add_dependencies(test_snapshot_live gpumemd gpumemctl gm-test-client)
foreach(heap local central)
  add_test(NAME snapshot_live_${heap} COMMAND test_snapshot_live)
  set_tests_properties(snapshot_live_${heap} PROPERTIES ENVIRONMENT "GPUMEM_TEST_BACKEND=host;GPUMEM_HEAP=${heap}"
                       TIMEOUT 600)
endforeach()
