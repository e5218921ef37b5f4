# Carried frees (issue 26): central sessions with GPUMEM_CARRY_FREES=1 send a
# free with the next Alloc. Real gpumemd, host backend.
add_executable(test_carried_frees ${CMAKE_CURRENT_LIST_DIR}/test_carried_frees.c)
target_link_libraries(test_carried_frees PRIVATE gm_testutil gpumem gm_ipc PkgConfig::CHECK)
add_dependencies(test_carried_frees gpumemd)
add_test(NAME carried_frees_host COMMAND test_carried_frees)
set_tests_properties(carried_frees_host PROPERTIES ENVIRONMENT "GPUMEM_TEST_BACKEND=host" TIMEOUT 300)
