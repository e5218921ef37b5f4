# Seeded random workloads on one heap, gm_heap_check() after every step. They
# run inside the unit group's allocator executable (its main runs every
# allocator suite), so the allocator test carries both labels.
target_sources(test_allocator PRIVATE ${CMAKE_CURRENT_LIST_DIR}/test_allocator_random.c)
set_property(TEST allocator APPEND PROPERTY LABELS stress)
