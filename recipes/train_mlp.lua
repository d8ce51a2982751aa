-- The direct-API example: an MLP (512 -> 2048 -> 2048 -> 10, ReLU) trained with AdamW on 4096
-- random inputs whose labels come from a fixed random linear rule (so the loss can fall).
-- Run: ./zrun recipes/train_mlp.lua [epochs] [batch_size] [lr=1e-4] [seed=0]   (--help lists the options)
local zr = require "zrun"
local nn, optim, data = zr.nn, zr.optim, zr.data

local cli = require("zrun.argparse").new("recipes/train_mlp.lua",
  "Trains an MLP (512 -> 2048 -> 2048 -> 10) with AdamW on random inputs labelled by a fixed linear rule.")
cli:option("epochs", 3, "passes over the 4096 samples")
cli:option("batch_size", 4, "samples per step")
cli:option("lr", 1e-4, "AdamW's learning rate")
cli:option("seed", 0, "seeds the data, the initial weights and the shuffling")
cli:positional("epochs", "batch_size")
local opt = cli:parse(arg)

local N, D_IN, HIDDEN, CLASSES = 4096, 512, 2048, 10
local EPOCHS, BATCH, LR = opt.epochs, opt.batch_size, opt.lr

zr.manual_seed(opt.seed)

-- Data: x ~ N(0, 1); label = argmax of a fixed random projection of x (0-based class ids).
local X = zr.randn(N, D_IN)
local projection = zr.randn(D_IN, CLASSES)
local _, argmax = zr.matmul(X, projection):max(2) -- 1-based positions
local Y = (argmax:float() - 1):long()
local loader = data.DataLoader{ dataset = data.TensorDataset(X, Y), batch_size = BATCH, shuffle = true, seed = opt.seed }

-- Model
local MLP = nn.Module:extend("MLP")

function MLP:__init(d_in, hidden, n_classes)
  self.fc1 = nn.Linear(d_in, hidden)
  self.fc2 = nn.Linear(hidden, hidden)
  self.fc3 = nn.Linear(hidden, n_classes)
  self.act = nn.ReLU()
end

function MLP:forward(x)
  x = self.act(self.fc1(x))
  x = self.act(self.fc2(x))
  return self.fc3(x)
end

local model = MLP(D_IN, HIDDEN, CLASSES)
local loss_fn = nn.CrossEntropyLoss()
local opt = optim.AdamW(model:parameters(), { lr = LR, weight_decay = 0.01 })

print(model)
print(("%d parameters, %d samples, batch size %d, %d batches per epoch"):format(
  model:num_parameters(), N, BATCH, #loader))

-- Training loop
local clock = os.clock
local wall = zr.now
local t_start, first_loss, last_loss = wall(), nil, nil
local c_start = clock()
for epoch = 1, EPOCHS do
  local t0 = wall()
  local total, count, correct = 0, 0, 0
  model:train()
  local bar = zr.progress { total = loader:len(), desc = "epoch " .. epoch, unit = "batch", leave = false }
  for x, y in loader:iter() do
    local logits = model(x)
    local loss = loss_fn(logits, y)
    opt:zero_grad()
    loss:backward()
    opt:step()
    total, count = total + loss:item(), count + 1
    bar:update(1, { loss = total / count })
  end
  bar:close()
  local mean = total / count
  first_loss = first_loss or mean
  last_loss = mean
  local dt = wall() - t0
  print(("epoch %d  loss %.4f  %.1f s  %.0f samples/s"):format(epoch, mean, dt, N / math.max(dt, 1e-9)))
end

-- Accuracy on the training set (eval mode, no autograd)
model:eval()
local acc = zr.no_grad(function()
  local _, pred = model(X):max(2)
  local hits = 0
  local p, y = pred:flat_table(), Y:flat_table()
  for i = 1, #p do if p[i] - 1 == y[i] then hits = hits + 1 end end
  return hits / #p
end)
local total_s = wall() - t_start
print(("done: loss %.4f -> %.4f, train accuracy %.1f%%, %.1f s wall (%.1f s CPU), %.0f samples/s"):format(
  first_loss, last_loss, 100 * acc, total_s, clock() - c_start, EPOCHS * N / math.max(total_s, 1e-9)))
