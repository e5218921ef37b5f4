# The inference-engine example (examples/engine.c, docs/inference.md, issue
# 27): a real daemon, the publisher and the two engines as processes of
# their own tenants (as root), the daemon's books checked after. Host, and
# the emulated cuda driver when the build has it.
find_program(GM_ENGINE_PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(GM_ENGINE_PYTHON3)
  add_test(NAME engine_example_host
    COMMAND ${GM_ENGINE_PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/engine_example.py $<TARGET_FILE:gpumemd>
            $<TARGET_FILE:gpumemctl> $<TARGET_FILE:gpumem-engine> host)
  set_tests_properties(engine_example_host PROPERTIES TIMEOUT 300)
  if(GPUMEM_HAVE_CUDA AND TARGET fakecuda)
    add_test(NAME engine_example_cuda
      COMMAND ${GM_ENGINE_PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/engine_example.py $<TARGET_FILE:gpumemd>
              $<TARGET_FILE:gpumemctl> $<TARGET_FILE:gpumem-engine> cuda)
    set_tests_properties(engine_example_cuda PROPERTIES TIMEOUT 300 ENVIRONMENT
      "GPUMEM_LIBCUDA=${GPUMEM_FAKECUDA};GPUMEM_LIBNVML=${GPUMEM_FAKENVML};FAKECUDA_CAPACITY=4G")
  endif()
endif()
