# embed.cmake — writes the fat binary IN as a C array NAME into the header OUT (cmake -P).
file(READ ${IN} hex HEX)
string(LENGTH "${hex}" n)
math(EXPR len "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
file(WRITE ${OUT} "/* generated from ${IN} by embed.cmake */\n"
  "static const unsigned char ${NAME}[] __attribute__((aligned(8))) = {${body}};\n"
  "static const unsigned long ${NAME}_len = ${len};\n")
