# cmake -DIN=file -DOUT=header.h -DNAME=kSymbol -P embed.cmake
# Writes `inline constexpr unsigned char NAME[] = {...};` holding the file's bytes,
# in namespace NS (default meshnet::api; -DNS=meshnet::registry for the registry page).
if(NOT NS)
  set(NS meshnet::api)
endif()
file(READ "${IN}" hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
file(WRITE "${OUT}" "// Generated from ${IN} by embed.cmake; do not edit.\n#pragma once\nnamespace ${NS} {\ninline constexpr unsigned char ${NAME}[] = {${bytes}};\n}  // namespace ${NS}\n")
