-- zr.nn: modules (Module, Linear, Embedding, RMSNorm, LayerNorm, activations, Dropout,
-- Sequential, ModuleList, CrossEntropyLoss), nn.Parameter, and initialisers in nn.init.
local Module = require "zrun.nn.module"
local act = require "zrun.nn.activations"

local nn = {
  Module = Module,
  Parameter = Module.Parameter,
  Linear = require "zrun.nn.linear",
  Embedding = require "zrun.nn.embedding",
  RMSNorm = require "zrun.nn.rmsnorm",
  LayerNorm = require "zrun.nn.layernorm",
  Dropout = require "zrun.nn.dropout",
  Sequential = require "zrun.nn.sequential",
  ModuleList = require "zrun.nn.modulelist",
  CrossEntropyLoss = require "zrun.nn.loss",
  ReLU = act.ReLU, GELU = act.GELU, SiLU = act.SiLU, Tanh = act.Tanh, Sigmoid = act.Sigmoid,
  init = require "zrun.nn.init_fns",
  is_module = Module.is_module,
}

return nn
