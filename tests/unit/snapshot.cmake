# Snapshot writer (pickle/JSON encoder, PyTorch snapshot schema) and OOM messages.
find_package(Python3 REQUIRED COMPONENTS Interpreter)
add_executable(test_snapshot ${CMAKE_CURRENT_LIST_DIR}/test_snapshot.c)
target_link_libraries(test_snapshot PRIVATE gm_allocator PkgConfig::CHECK)
target_compile_definitions(test_snapshot PRIVATE
  GM_PYTHON3="${Python3_EXECUTABLE}"
  GM_SNAPSHOT_CHECK="${GM_SNAPSHOT_CHECK}")
add_test(NAME snapshot COMMAND test_snapshot)

add_executable(test_oom ${CMAKE_CURRENT_LIST_DIR}/test_oom.c)
target_link_libraries(test_oom PRIVATE gm_allocator PkgConfig::CHECK)
add_test(NAME oom COMMAND test_oom)
