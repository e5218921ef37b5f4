# Allocator core: policy and reuse tests on a fake provider (the same
# executable runs stress/'s seeded random workloads: stress/allocator_random.cmake).
add_executable(test_allocator
  ${CMAKE_CURRENT_LIST_DIR}/test_allocator.c
  ${CMAKE_CURRENT_LIST_DIR}/test_allocator_reuse.c
  ${CMAKE_CURRENT_LIST_DIR}/test_allocator_tags.c
  ${GM_TEST_LIB_DIR}/fake_provider.c)
target_include_directories(test_allocator PRIVATE ${GM_TEST_LIB_DIR})
target_link_libraries(test_allocator PRIVATE gm_allocator PkgConfig::CHECK)
add_test(NAME allocator COMMAND test_allocator)
set_tests_properties(allocator PROPERTIES TIMEOUT 600)

# Rebuilding a heap from its client's ledger (daemon restart).
add_executable(test_restore ${CMAKE_CURRENT_LIST_DIR}/test_restore.c ${GM_TEST_LIB_DIR}/fake_provider.c)
target_include_directories(test_restore PRIVATE ${GM_TEST_LIB_DIR})
target_link_libraries(test_restore PRIVATE gm_allocator PkgConfig::CHECK)
add_test(NAME allocator_restore COMMAND test_restore)

# The free set's AVL tree on its own: every insert and remove checked.
add_executable(test_freeset ${CMAKE_CURRENT_LIST_DIR}/test_freeset.c)
target_link_libraries(test_freeset PRIVATE gm_allocator PkgConfig::CHECK)
add_test(NAME allocator_freeset COMMAND test_freeset)
