# Tagged pools (docs/tags.md): a real gpumemd, this process and a forked child
# as clients, local and central heaps, gpumemctl clients/snapshot; on the
# host backend, and on the cuda backend over the emulated driver when built.
add_executable(test_tags ${CMAKE_CURRENT_LIST_DIR}/test_tags.c)
target_link_libraries(test_tags PRIVATE gm_testutil gpumem gm_ipc PkgConfig::CHECK)
find_package(Python3 REQUIRED COMPONENTS Interpreter)
target_compile_definitions(test_tags PRIVATE GPUMEMCTL_BIN="$<TARGET_FILE:gpumemctl>"
  GM_PYTHON3="${Python3_EXECUTABLE}" GM_SNAPSHOT_CHECK="${GM_SNAPSHOT_CHECK}")
target_include_directories(test_tags PRIVATE ${CMAKE_SOURCE_DIR}/allocator) # the statistics page's layout
add_dependencies(test_tags gpumemd gpumemctl)
add_test(NAME tags_host COMMAND test_tags)
set_tests_properties(tags_host PROPERTIES ENVIRONMENT "GPUMEM_TEST_BACKEND=host" TIMEOUT 300)
if(GPUMEM_HAVE_CUDA AND TARGET fakecuda)
  add_dependencies(test_tags fakecuda fakenvml)
  add_test(NAME tags_cuda COMMAND test_tags)
  set_tests_properties(tags_cuda PROPERTIES TIMEOUT 300 ENVIRONMENT
    "GPUMEM_TEST_BACKEND=cuda;GPUMEM_LIBCUDA=${GPUMEM_FAKECUDA};GPUMEM_LIBNVML=${GPUMEM_FAKENVML};FAKECUDA_CAPACITY=4G")
endif()
