# The gpumem Python package installed with pip's tools: the wheel of
# scripts/build-wheel.sh (carrying libgpumem and libgpumem_torch) in a fresh
# venv, and `pip install ./python` where pip runs; each allocates through a
# real gpumemd (tests/integration/wheel_check.sh).
find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  add_test(NAME python_wheel COMMAND ${CMAKE_CURRENT_LIST_DIR}/wheel_check.sh ${CMAKE_BINARY_DIR} ${CMAKE_SOURCE_DIR}
                                     ${Python3_EXECUTABLE} "${GM_PYTHON_SANITIZER_ENV}")
  set_tests_properties(python_wheel PROPERTIES TIMEOUT 300)
endif()
