"""specviz's own CPU kernels, each one C++ source beside the one Python module that builds, loads and describes it,
with the order its sums run in stated at the top of both (exactness depends on it):

- `streamed`: a linear for few rows that reads each weight once; each row's sums run in one order whatever the
  number of rows;
- `amx`: the bf16 linear on AMX tiles, reading `streamed`'s copy: 16 rows for about the price of one; each row's
  sums run in one order (its own) whatever the number of rows;
- `rows`: attention one query row at a time over its keys in order: a verify's row attends exactly as the one-token
  step at its position does.

`build` compiles a source once per machine into the cache (the machine's C++ compiler) and says once, in one
sentence, where it cannot. Below the models, which choose among these kernels by measurement; above nothing of
specviz's but the cache folder.
"""
