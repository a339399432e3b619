-- wrk script: POST a KServe v2 infer request of exactly BODY_BYTES bytes
-- (a valid JSON body: one FP32 input whose data is 0.125 repeated, padded
-- with trailing spaces to the exact size).
local n = tonumber(os.getenv("BODY_BYTES") or "200")
local head = '{"inputs":[{"name":"x","shape":[-1],"datatype":"FP32","data":[0.125'
local tail = ']}]}'
local parts = {head}
local len = #head + #tail
while len + 6 <= n do
  parts[#parts + 1] = ",0.125"
  len = len + 6
end
parts[#parts + 1] = tail
local body = table.concat(parts)
body = body .. string.rep(" ", n - #body)
wrk.method = "POST"
wrk.body = body
wrk.headers["Content-Type"] = "application/json"
