-- zr.optim: optimizers with torch.optim semantics (AdamW, SGD), DeepSpeed's Lamb, and their base class.
return {
  Optimizer = require "zrun.optim.optimizer",
  AdamW = require "zrun.optim.adamw",
  SGD = require "zrun.optim.sgd",
  Lamb = require "zrun.optim.lamb",
}
